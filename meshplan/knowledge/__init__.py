"""What meshplan knows: the YAML cards (loaded and validated), hardware, calibration constants, the model
catalog and Hugging Face config.json ingestion with exact parameter counts, the decision tables."""
