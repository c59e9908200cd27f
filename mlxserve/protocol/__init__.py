"""The neutral core's vocabulary: requests and errors that no wire format owns.

Every dialect at the edge (api/openai, api/anthropic) turns its JSON into these and maps
them back; chat/, structured/, engine/ and models/ see nothing else."""
