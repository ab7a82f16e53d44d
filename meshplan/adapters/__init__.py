"""Framework adapters: turn a `Plan` into the config snippet a training framework accepts.

`render(framework, job, plan)` (in `render.py`) picks the target's builder, which computes the
framework's own keys from the plan, and a Jinja template (`templates/<target>.j2`) that lays them
out. What each framework can express lives in the `adapter` section of its card
(`cards/frameworks/<name>.yaml`); a plan that uses a knob the framework lacks is refused with the
knob's name and what to use instead, never rendered silently wrong.

The package imports nothing itself: the MCP server reads the card helpers of `capabilities.py` at
start-up, and the renderer (with Jinja) loads on the first render (`meshplan.adapters.render`).
"""
