"""Model execution: the `Engine` seam (`base.py`) and the embedded PyTorch engine (`embedded.py`,
`load_engine`). Heavy modules are imported by their users, not here."""
