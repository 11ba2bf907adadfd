"""HTTP routes: one thin APIRouter module per resource."""
