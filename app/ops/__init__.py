"""Operations: logging, metrics, schema guard (health answers are app/api/health.py)."""
