//! API server on a unix socket, per-sandbox serialisation, readiness, reconciliation.
