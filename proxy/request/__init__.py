"""The request side: one parse and one splice for routing, sampling and reasoning effort."""
