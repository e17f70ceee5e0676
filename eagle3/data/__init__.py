"""Dataset catalog, discovery, normalization, dedup/decontamination and the shared Parquet shard
writer; the discover and normalize stages are ``eagle3.data.stage``."""
