"""The bottom layer: the user-facing error type, cooperative cancellation, units, where the card files live.
Imports nothing else from meshplan."""
