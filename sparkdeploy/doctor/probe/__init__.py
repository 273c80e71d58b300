"""The probe script that runs inside the serving image (torch + stdlib only; copied to the nodes at run time)."""
