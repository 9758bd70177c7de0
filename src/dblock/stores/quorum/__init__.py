"""The quorum: the store contract over three or more stores, each lock held on a majority.

It has no URL scheme of its own: a list of member URLs opens it (``dblock.connect([...])``).
``rules.py`` is what it decides (no I/O), ``store.py`` the store over the members,
``fanout.py`` how the async client asks them all at once."""
