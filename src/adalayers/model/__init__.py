"""The model: bases and their layer taps, the mixer, heads and the side task."""
