"""Tool calling on /v1/chat/completions: the request's tools, the prompt, the call formats, enforcement."""
