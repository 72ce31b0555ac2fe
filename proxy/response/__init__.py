"""The live response side: the stream pipeline, reasoning-field rename, degeneration detectors, flags."""
