"""Shards and sidecars in object storage (``s3://``, ``gs://``, any fsspec URL), read through a local block cache.

* :mod:`.url`: which paths are URLs, their filesystem, globs and joins.
* :mod:`.options`: :class:`~.options.StoreOptions`, the cache folder, its size limit, the block size and the
  fault deadline, from the environment.
* :mod:`.retry`: every store call retried with backoff until a deadline, then one line naming the object.
* :mod:`.batch`: many requests in one round (every shard's look-up, sidecars or blocks at once).
* :mod:`.tagged`: reads that answer the version (ETag, size) they read, written into the cache as they arrive.
* :mod:`.lookup`: every shard's and sidecar's size and ETag, one listing per folder.
* :mod:`.cache`: the cache folder, its objects least recently used first, evicted down to the limit.
* :mod:`.sidecars`: a shard's sidecars in the cache with the versions they are.
* :mod:`.listing`: what a URL names: a glob's objects, a folder's TFRecord objects, a remote ``dataset.json``.
* :mod:`.mirror`: one remote shard as a local sparse file whose fixed-size blocks are fetched on demand.
* :mod:`.publish`: ``evenflow index`` of a remote shard: its sidecars written back next to it.
"""
