"""Day zero on new Sparks: discover the nodes and write the inventory (`init`), put this machine's key on them
(`setup ssh`), fabric addresses (`setup network`). See discover.py (what is read on a node), proposal.py (what
the inventory proposes and the problems found), inventory_text.py (the commented inventory), login.py (connecting
with host keys confirmed)."""
