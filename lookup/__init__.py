"""The online lookup: the HTTP service, the stores it reads (embedded snapshot, Redis) behind one
interface, its client and its wire format. Reads the tables and the tier rule that feature_store/
declares; nothing in spark_jobs/ or feature_store/ imports it."""
