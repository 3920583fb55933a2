"""Web observations: accessibility trees as WebArena/BrowserGym agents see them (`[12] link 'Orders'` for
elements one can act on, bare `StaticText` and structure nodes, repeated row and card subtrees) and JSON
results of HTTP calls (never pruned: JSON stays byte-identical)."""

from __future__ import annotations

import json
import random

from agents_eval.bench.quality.tool_questions import PRODUCTS, Observation, code

NAV = ("Dashboard", "Sales", "Catalog", "Customers", "Marketing", "Reports", "Stores", "System")
WAREHOUSES = ("Reno-2", "Columbus-1", "Dallas-4", "Newark-3", "Tracy-1", "Joliet-2")


class _Ids:
    """Element ids as a page hands them out: increasing, with gaps for elements the tree leaves out."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._next = rng.randint(10, 140)

    def __call__(self) -> int:
        self._next += self._rng.randint(1, 6)
        return self._next


def _tree(title: str, lines: list[str]) -> str:
    return "\n".join([f"RootWebArea '{title}' focused: True", *lines])


def _price(rng: random.Random) -> str:
    return f"{rng.randint(11, 899)}.{rng.randint(10, 99)}"


def order_page(rng: random.Random) -> Observation:
    ids = _Ids(rng)
    order, total = f"000000{rng.randint(100, 999)}", _price(rng)
    lines = [f"\t[{ids()}] link '{label}'" for label in NAV[:3]]
    lines += [f"\theading '# {order}'", *[f"\t[{ids()}] button '{label}'" for label in ("Back", "Invoice", "Ship")],
              "\ttable 'Order Totals'"]
    rows = [("Subtotal", f"${_price(rng)}"), ("Shipping & Handling", f"${rng.randint(5, 30)}.00"),
            ("Grand Total", f"${total}"), ("Total Paid", "$0.00")]
    for header, cell in rows:
        lines += ["\t\trow ''", f"\t\t\trowheader '{header}'", f"\t\t\tgridcell '{cell}'"]
    url = f"/admin/sales/order/view/{order}/"
    return Observation("tree", "browser", f"open {url}", {"action": "goto", "url": url},
                       _tree(f"# {order} / Orders / Sales / Magento Admin", lines),
                       f"On the page {url}, what is the Grand Total of order {order}? Answer with the amount only.",
                       total, "order_page")


def product_grid(rng: random.Random) -> Observation:
    ids = _Ids(rng)
    query = rng.choice(("usb", "wireless", "smart home", "fitness", "audio"))
    products = rng.sample(PRODUCTS, 3)
    prices = [_price(rng) for _ in products]
    target = rng.randrange(len(products))
    lines = [f"\t[{ids()}] searchbox 'Search'", f"\theading 'Search results for: {query}'", "\tlist ''"]
    for product, price in zip(products, prices, strict=True):
        lines += ["\t\tlistitem ''", f"\t\t\t[{ids()}] link '{product}'", f"\t\t\tStaticText '${price}'",
                  "\t\t\tStaticText 'Rating:'", f"\t\t\t[{ids()}] button 'Add to Cart'"]
    url = f"/catalogsearch/result/?q={query.replace(' ', '+')}"
    return Observation("tree", "browser", f"open {url}", {"action": "goto", "url": url},
                       _tree(f"Search results for: '{query}'", lines),
                       f"On the search results page {url}, what is the price of the '{products[target]}'? "
                       "Answer with the price only.", prices[target], "products")


def store_config(rng: random.Random) -> Observation:
    ids = _Ids(rng)
    fields = {"Store Name": rng.choice(("Luma Outlet", "Luma Store", "Shop Central")),
              "Store Phone Number": f"555-{rng.randint(1000, 9999)}", "ZIP/Postal Code": str(rng.randint(10000, 99999))}
    target = rng.choice(["Store Phone Number", "ZIP/Postal Code"])
    lines = [f"\t[{ids()}] link '{label}'" for label in NAV[:3]]
    lines += ["\theading 'Configuration'", f"\t[{ids()}] button 'Save Config'", "\tgroup 'Store Information'"]
    for label, value in fields.items():
        lines += [f"\t\tStaticText '{label}'", f"\t\t[{ids()}] textbox '{label}' value: '{value}'",
                  "\t\tStaticText '[STORE VIEW]'"]
    url = "/admin/admin/system_config/edit/section/general/"
    return Observation("tree", "browser", f"open {url}", {"action": "goto", "url": url},
                       _tree("Configuration / Settings / Stores / Magento Admin", lines),
                       f"What is the {target} in the store configuration? Answer with the value only.",
                       fields[target], "config")


def _http(method: str, path: str, body: object, indent: int | None) -> tuple[str, dict[str, str], str]:
    return f"{method} {path}", {"method": method, "url": path}, json.dumps(body, indent=indent, ensure_ascii=False)


def order_json(rng: random.Random) -> Observation:
    order = rng.randint(1000, 9999)
    tracking = f"1Z{rng.randint(10 ** 5, 10 ** 6 - 1)}"
    body = {"id": order, "status": "shipped", "carrier": rng.choice(("UPS", "FedEx", "DHL")),
            "tracking_number": tracking, "items": [{"sku": code(rng, "SKU", 5), "qty": rng.randint(1, 4)}
                                                   for _ in range(2)], "gift_message": None}
    command, arguments, text = _http("GET", f"/api/v2/orders/{order}", body, 2)
    return Observation("json", "http", command, arguments, text,
                       f"What is the tracking number of order {order}, as `{command}` returned it? "
                       "Answer with the tracking number only.", tracking, "order")


def inventory_json(rng: random.Random) -> Observation:
    sku = code(rng, "SKU", 3)
    available = rng.randint(100, 999)
    body = {"sku": sku, "warehouse": rng.choice(WAREHOUSES), "available": available, "status": "in_stock"}
    command, arguments, text = _http("GET", f"/api/v2/inventory/{sku}", body, None)
    return Observation("json", "http", command, arguments, text,
                       f"How many units of {sku} are available? Answer with the number only.", str(available),
                       "inventory")


def error_json(rng: random.Random) -> Observation:
    reason = rng.choice(("RATE_LIMITED", "CARD_DECLINED", "STALE_VERSION", "QUOTA_EXCEEDED"))
    error = f"{reason}_{rng.randint(1000, 9999)}"
    path = f"/api/v2/{rng.choice(('refunds', 'payouts', 'captures'))}"
    body = {"error": {"code": error, "message": "The request could not be completed.",
                      "retry_after": rng.randint(5, 120)}, "request_id": f"req_{rng.getrandbits(40):010x}"}
    command, arguments, text = _http("POST", path, body, 2)
    return Observation("json", "http", command, arguments, text,
                       f"Which error code did `{command}` return? Answer with the code only.", error, "error")


TREES = (order_page, product_grid, store_config)
JSONS = (order_json, inventory_json, error_json)
