"""What runs inside the stack gateway's container (the LiteLLM proxy image), copied as files into the gateway's state
dir by deploy/stack/units.py under the names they carry here: gateway_hook.py (LiteLLM's `custom_auth` and the
routes' reload) and gateway_spend.py (each key's token counts). Standard library and LiteLLM only; sparkdeploy never
imports them (tests do)."""
