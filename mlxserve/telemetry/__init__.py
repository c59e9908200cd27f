"""What operators see: per-request records (request ids, the access log) and the
Prometheus metrics built from them. Below the HTTP edge: the service fills the record."""
