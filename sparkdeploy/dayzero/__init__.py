"""Day zero on new Sparks: discover the nodes and write the inventory (`init`), put this machine's key on them
(`setup ssh`). See discover.py (what is read on a node), plan.py (what the inventory proposes and the problems
found), inventory_text.py (the commented inventory), session.py (connecting with host keys confirmed)."""
