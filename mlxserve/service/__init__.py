"""The neutral service every dialect calls: a request is prepared (prompt, sampling,
grammar, output pipeline), run on the generation thread, and its choices come back as
post-processed events and accumulated results."""
