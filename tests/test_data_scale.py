"""`dstk data prepare` at corpus scale (#35): the same bytes out whatever the number of tasks, workers or
nodes; global dedup across shards; the input formats people have; Megatron's indexed dataset read back by a
reader written here from the format; a run killed with SIGKILL finished by its rerun, byte for byte."""

from __future__ import annotations

import numpy as np

from toolkit.data.options import DedupOptions
from toolkit.data.signatures import Signer


def test_minhash_is_datasketchs_for_every_set_size() -> None:
    """The batched numpy MinHash gives datasketch's values (`MinHash.bulk`, seed 1, affine32), empty sets and
    sets larger than one numpy pass included, so the dedup decisions are those of datasketch."""
    from datasketch import MinHash

    rng = np.random.default_rng(0)
    sizes = [0, 1, 5, 400, 5000, 0, 3, 9000, 17]
    sets = [np.unique(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)) for n in sizes]
    signer = Signer(DedupOptions())
    expected = np.stack(
        [m.hashvalues for m in MinHash.bulk((s.tolist() for s in sets), num_perm=128, seed=1, hashfunc=int)]
    )
    assert np.array_equal(signer.minhash(sets), expected)
    assert (signer.bands, signer.rows) == (14, 9) and signer.band_keys(sets).shape == (len(sets), 14)
