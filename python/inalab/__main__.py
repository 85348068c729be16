"""`python -m inalab ...` is the `inalab` command."""
from .cli import app

app()
