-- Example queries over the SOLARIS feature tables. Run them with
--   python -m include.sql --file docs/example_queries.sql          (or make sql Q="...")
--   spark-sql --properties-file "$(python -m include.spark)" -f docs/example_queries.sql
-- A replayed lake has no wall-clock "now": these use the newest precompute run's time t instead
-- (SELECT max(interval_end) FROM solaris.precompute_runs); on a live lake use current_timestamp().

-- Coverage by tier for a day: the share of logged candidates served by each tier.
SELECT date, tier, count(*) AS candidates,
       round(count(*) / sum(count(*)) OVER (PARTITION BY date), 4) AS share
FROM solaris.request_features
WHERE date = (SELECT max(date) FROM solaris.request_features)
GROUP BY date, tier
ORDER BY date, tier;

-- Pair embeddings that expire in the hour after the newest run (and so must be recomputed or fall back).
SELECT count(*) AS expiring_pairs, min(expires_at) AS first_expiry, max(expires_at) AS last_expiry
FROM solaris.pair_embeddings
WHERE expires_at > (SELECT max(interval_end) FROM solaris.precompute_runs)
  AND expires_at <= (SELECT max(interval_end) FROM solaris.precompute_runs) + INTERVAL 1 HOUR;

-- Top users by stored pair embeddings still valid at the newest run.
SELECT user_id, count(*) AS pairs, max(computed_at) AS newest
FROM solaris.pair_embeddings
WHERE expires_at > (SELECT max(interval_end) FROM solaris.precompute_runs)
GROUP BY user_id
ORDER BY pairs DESC, user_id
LIMIT 10;

-- The newest precompute run's counters.
SELECT run_id, pairs_scored, pairs_selected, already_fresh, pairs_embedded, expired_removed,
       queue_in, queue_waiting, vm_version, fm_version, seconds
FROM solaris.precompute_runs
ORDER BY interval_end DESC
LIMIT 1;
