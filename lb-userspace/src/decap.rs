//! Backend-side decapsulation: loading, attaching and pinning `lb_decap` (being written).
