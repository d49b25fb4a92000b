"""The Ray Serve application: engine replicas as multiplexed deployments behind the HTTP
server's own app (``deployments``), and the ingress's engine over their handle
(``remote_engine``). Above ``server`` and ``deploy``; only the command line imports it (Ray
is an optional extra)."""
