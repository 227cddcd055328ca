"""Endpoint groups of the HTTP service, one module each. Every module has add_routes(app, state): it
registers its routes (and any middleware they need) on the FastAPI app, reading the heads, settings,
batcher and decoder from state (serve/state.ServeState); create_app lists each module once (app.ROUTERS)."""
