"""What is kept on disk: run folders, the resumable training state, the hidden-state cache, the Hub."""
