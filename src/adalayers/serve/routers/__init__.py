"""HTTP routes of `adalayers serve`, one module per endpoint group (registered in serve/app.create_app)."""
