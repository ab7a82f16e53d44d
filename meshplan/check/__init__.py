"""`check_config`: every rule of the framework, the structural ones and those that read the memory estimate
(does it fit, does the host hold what is offloaded, does each RL phase fit), with fixes that are re-estimated."""
