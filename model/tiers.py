"""Where a served FM embedding came from: the tier names, declared once. The resolution rule
(feature_store/resolution.py) assigns them and the VM (model/vm.py) reads them as an input, so
both import them from here; this module imports nothing, so the lookup can use it without torch.

A tier's code is its index in ``TIERS``: the lookup's binary answer and ``/metrics`` carry it, so
a tier added later takes the next code and the codes of the others never change. The order in
which the rule tries them is ``ORDER``."""

TIERS = ("exact", "user_mean", "neighbor", "none", "item_mean")  # codes 0..4, stable on the wire
EXACT, USER_MEAN, NEIGHBOR, NONE, ITEM_MEAN = range(len(TIERS))
# First match wins. The item's mean code across users comes before the user's mean: a user mean
# repeats what the VM's user id already knows, an item's recent mean carries what the FM knows of
# the item now (its attributes, freshness, popularity), new items included.
ORDER = ("exact", "item_mean", "user_mean", "neighbor", "none")
