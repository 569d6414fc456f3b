"""HTTP only: routes, the ingest API, /metrics, TLS and auth. Talks to the service, never to hardware."""
