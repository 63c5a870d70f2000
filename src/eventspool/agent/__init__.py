"""The local agent: spools events sent over a socket by processes in any language."""
