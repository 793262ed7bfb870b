"""Where a served FM embedding came from: the tier names, declared once. The resolution rule
(feature_store/resolution.py) assigns them and the VM (model/vm.py) reads them as an input, so
both import them from here; this module imports nothing, so the lookup can use it without torch."""

TIERS = ("exact", "user_mean", "neighbor", "none")  # first match wins, in this order
EXACT, USER_MEAN, NEIGHBOR, NONE = range(len(TIERS))
