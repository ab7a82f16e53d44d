"""The frameworks' structural rules: the registry (`engine`: rule ids from cards/rules.yaml, `require_estimable`)
and the conditions that need no memory estimate, by family. The rules that read the estimate are in `check/`."""
