"""Data for `dstk train`: a generated demo corpus, a locally trained tokenizer, packing into fixed-length
sequences (`dstk data prepare`), and a deterministic, resumable, prefetching loader."""
