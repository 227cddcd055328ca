"""Hidden-state cache: the frozen base runs once per dataset split, training reads its layers from disk.

    store.py   the on-disk format (npy shards + manifest), locking, checks
    source.py  CachedStates: states.LiveStates' interface, served from the store
    cli.py     adalayers cache build / ls / rm
"""
from adalayers.store.cache.source import CachedStates, cache_dir, cached_source
from adalayers.store.cache.store import CacheError

__all__ = ["CachedStates", "CacheError", "cache_dir", "cached_source"]
