"""The context window: know each upstream's, clamp what can't fit, name an overflow the way agents recognise it."""
