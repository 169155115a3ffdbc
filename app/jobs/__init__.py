"""The job domain: the spec's vocabularies, the pure reducer, kind contracts, routing, timing rules
and validation. No I/O."""
