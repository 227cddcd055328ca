"""Route groups of the HTTP service, one module each; create_app registers them with one line each."""
