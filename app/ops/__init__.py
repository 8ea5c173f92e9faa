"""Operations: logging, health, metrics, schema guard."""
