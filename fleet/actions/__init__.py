"""The fleet's state changes and the gate, one module per aggregate (`fleet.services` is the
app's public face and re-exports them)."""
