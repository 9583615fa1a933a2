"""MARP: model specs, GPU catalog, memory and step-time models, plan search (pure, no I/O
beyond reading the packaged GPU catalog)."""
