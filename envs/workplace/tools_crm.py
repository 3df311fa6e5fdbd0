"""The office's customer relationship manager tools, as NeMo Gym's (names, arguments, results, refusals).

As in NeMo Gym: customer addresses are any text (NeMo Gym's own have no TLD, e.g.
"jaden.white@protracefoods") and are lowercased, the date filters compare as text with the
stored "YYYY-MM-DD HH:MM:SS" values (so a bound with or without a time works), status and
product must be written exactly when updated (not when a customer is added), and a new
customer's `notes` is "" unless given.
"""

from __future__ import annotations

from typing import Any, Optional

from envs.workplace.checks import contains, lowered, paginate, pattern, text
from envs.workplace.office import PRODUCTS, STATUSES, Office, ToolError, lookup
from envs.workplace.toolset import DATE, TOOLS, WRITES

UPDATABLE = ["customer_name", "assigned_to_email", "customer_email", "customer_phone", "last_contact_date"]
UPDATABLE += ["product_interest", "status", "notes", "follow_up_by"]
TEXT_FILTERS = ["customer_name", "customer_email", "product_interest", "status", "assigned_to_email"]


@TOOLS.tool(
    "Searches for customers based on the given parameters with pagination support.",
    customer_name="Name of the customer",
    customer_email="Email address of the customer",
    product_interest="Product interest of the customer",
    status="Current status of the customer",
    assigned_to_email="Email address of the person assigned to the customer",
    last_contact_date_min=f"Minimum last contact date. {DATE}",
    last_contact_date_max=f"Maximum last contact date. {DATE}",
    follow_up_by_min=f"Minimum follow up date. {DATE}",
    follow_up_by_max=f"Maximum follow up date. {DATE}",
    page="Page number of results to return",
    page_size="Number of customers per page",
)
def customer_relationship_manager_search_customers(
    office: Office,
    customer_name: Optional[str] = None,
    customer_email: Optional[str] = None,
    product_interest: Optional[str] = None,
    status: Optional[str] = None,
    assigned_to_email: Optional[str] = None,
    last_contact_date_min: Optional[str] = None,
    last_contact_date_max: Optional[str] = None,
    follow_up_by_min: Optional[str] = None,
    follow_up_by_max: Optional[str] = None,
    page: int = 1,
    page_size: int = 5,
) -> Any:
    terms = dict(zip(TEXT_FILTERS, [customer_name, customer_email, product_interest, status, assigned_to_email]))
    bounds = [
        ("last_contact_date", last_contact_date_min, True),
        ("last_contact_date", last_contact_date_max, False),
        ("follow_up_by", follow_up_by_min, True),
        ("follow_up_by", follow_up_by_max, False),
    ]
    if not any([*terms.values(), *(b for _, b, _ in bounds)]):
        raise ToolError("No search parameters provided. Please provide at least one parameter.")
    found = list(office.customers.values())
    for name, value in terms.items():
        if value:
            term = pattern(value, name)
            found = [c for c in found if contains(term, c.get(name))]
    for name, bound, lower in bounds:
        if bound:
            edge = text(bound, f"{name}_{'min' if lower else 'max'}")
            found = [
                c for c in found if isinstance(c.get(name), str) and (c[name] >= edge if lower else c[name] <= edge)
            ]
    if not found:
        return "No customers found."
    return paginate(found, page, page_size, "customers")


@TOOLS.tool(
    "Updates a customer record by ID.",
    meta=WRITES,
    customer_id="ID of the customer",
    field="Field to update. Available fields are: " + ", ".join(f"'{f}'" for f in UPDATABLE),
    new_value="New value for the field",
)
def customer_relationship_manager_update_customer(office: Office, customer_id: str, field: str, new_value: str) -> str:
    """The id column itself cannot be rewritten here (NeMo Gym would): it is the record's key."""
    if not customer_id or not field or not new_value:
        raise ToolError("Customer ID, field, or new value not provided.")
    if field == "status" and new_value not in STATUSES:
        raise ToolError("Status not valid. Please choose from: " + ", ".join(f"'{x}'" for x in STATUSES))
    if field == "product_interest" and new_value not in PRODUCTS:
        raise ToolError("Product interest not valid. Please choose from: " + ", ".join(f"'{x}'" for x in PRODUCTS))
    value: Any = lowered(new_value, "new_value") if field in ("customer_email", "assigned_to_email") else new_value
    record = lookup(office.customers, customer_id)
    if record is None:
        raise ToolError("Customer not found.")
    if not isinstance(field, str) or field not in record or field == "customer_id":
        raise ToolError("Field not valid. Please choose from: " + ", ".join(f"'{f}'" for f in UPDATABLE))
    record[field] = value
    return "Customer updated successfully."


@TOOLS.tool(
    "Adds a new customer record.",
    meta=WRITES,
    customer_name="Name of the customer",
    assigned_to_email="Email address of the person assigned to the customer",
    status="Current status of the customer. One of: " + ", ".join(f"'{x}'" for x in STATUSES),
    customer_email="Email address of the customer",
    customer_phone="Phone number of the customer",
    last_contact_date=f"The last date the customer was contacted. {DATE}",
    product_interest="Product interest of the customer. One of: " + ", ".join(f"'{x}'" for x in PRODUCTS),
    notes="Notes about the customer",
    follow_up_by=f"Date for the next follow up. {DATE}",
)
def customer_relationship_manager_add_customer(
    office: Office,
    customer_name: str,
    assigned_to_email: str,
    status: str,
    customer_email: Optional[str] = None,
    customer_phone: Optional[str] = None,
    last_contact_date: Optional[str] = None,
    product_interest: Optional[str] = None,
    notes: str = "",
    follow_up_by: Optional[str] = None,
) -> str:
    if not all([customer_name, assigned_to_email, status]):
        raise ToolError("Please provide all required fields: customer_name, assigned_to_email, status.")
    owner = lowered(assigned_to_email, "assigned_to_email")
    address = lowered(customer_email, "customer_email") if customer_email else customer_email
    given = {
        "assigned_to_email": owner,
        "customer_name": customer_name,
        "customer_email": address,
        "customer_phone": customer_phone,
        "last_contact_date": last_contact_date,
        "product_interest": product_interest,
        "status": status,
        "follow_up_by": follow_up_by,
        "notes": notes,
    }
    return office.create("customers", "customer_id", given)


@TOOLS.tool("Deletes a customer record by ID.", meta=WRITES, customer_id="ID of the customer")
def customer_relationship_manager_delete_customer(office: Office, customer_id: str) -> str:
    return office.delete("customers", customer_id, "Customer")
