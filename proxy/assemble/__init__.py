"""A response (Chat Completions, Responses, Messages) folded into one assembled message."""
