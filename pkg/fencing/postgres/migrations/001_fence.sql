-- kubelock fencing: the highest fencing token accepted per lock key.
CREATE TABLE IF NOT EXISTS kubelock_fence (
    lock_key   text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
