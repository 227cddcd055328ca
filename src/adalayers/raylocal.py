"""Ray for adalayers' optional engines: import it (or say how to install it), start a loopback-only local Ray.

A local Ray talks over loopback only: ray.init(_node_ip_address="127.0.0.1") alone is not enough (Ray
swaps a loopback node address for the machine's routable one), so Ray is put in the mode it uses on
laptops, where its node-address lookup answers 127.0.0.1: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the
environment (read by every Ray process started from here) and, when `ray` was already imported before
this module could set it (a test's importorskip, a user's own `import ray`), the same switch in the
imported Ray. After the start the node address is checked: anything but 127.0.0.1 stops Ray with a
one-line error rather than running on the machine's network address. (Ray's gRPC servers still listen
on every interface, which Ray does not let a user change; every connection goes to 127.0.0.1.)
No dashboard, no usage stats. With an address, Ray joins that cluster instead.
"""
from __future__ import annotations

import os

from adalayers.errors import ConfigError

INSTALL = "--engine ray needs Ray: pip install 'adalayers[ray]'"
# Ray Serve kills a proxy that is not ready within 5 s (health check: 10 s); a local Ray on a small, busy
# machine can take longer, so a local Ray waits longer (a cluster keeps its own settings).
BUSY_MACHINE_TIMEOUTS = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}


def import_ray(local: bool = True):
    """ray (with ray.data and ray.serve), or a one-line ConfigError saying how to install it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        for name, seconds in BUSY_MACHINE_TIMEOUTS.items():  # inherited by the local Ray's processes
            os.environ.setdefault(name, seconds)
    try:
        import ray
        import ray.data  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL) from None
    if local:  # Ray read the switch when it was imported, possibly before the line above set it
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    return ray


def init_ray(address: str | None = None, num_cpus: int = 2) -> bool:
    """Join `address`, or start a loopback-only local Ray with num_cpus logical CPUs; True when this call started it."""
    ray = import_ray(local=not address)
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return True
    for attempt in (1, 2):  # Ray gives its raylet a fixed 30 s to register: a busy machine may need a second try
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                     configure_logging=False)
            break
        except Exception as e:  # noqa: BLE001  (Ray raises a bare Exception for this)
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
            ray.shutdown()
    node = ray.util.get_node_ip_address()
    if node != "127.0.0.1":
        ray.shutdown()
        raise ConfigError(f"the local Ray started on {node}, not on loopback 127.0.0.1; set "
                          f"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported")
    return True
