"""The real-engine suite: tapfix in front of llama.cpp's llama-server serving a tiny model made in code."""
