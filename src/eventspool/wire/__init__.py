"""What a caller and the agent must agree on: the frame format, the meaning of each status
and the checks a `send()` argument passes before it is encoded.

It sits below storage and the sender and above the compiled core, so the clients need
nothing from the agent's package, and the in-process `Spool` checks arguments by the same
rules as the clients.
"""
