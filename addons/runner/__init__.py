"""The runner: mitmproxy started in this process with tapfix's addon chain, and the state the addons share.

Kept apart from the addon classes (one per concern, in `tapfix.addons`), which only hold hooks.
"""
