"""Click entry points only; library errors become ``Error: ...``."""
