package api

// Role is an operator token's role. Roles are ordered: every route declares
// the lowest role that may call it, and a higher role may call everything a
// lower one may.
//
//   - viewer: read only (GET routes; not the token list, not recordings).
//   - operator: hosts, tasks, instances, allocations, terminals, slots and
//     placements: everything except tokens, signing keys and host revoke.
//   - admin: everything, including tokens, signing keys and host revoke.
type Role string

// Operator token roles, lowest first.
const (
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Roles lists every role, lowest first.
var Roles = []Role{RoleViewer, RoleOperator, RoleAdmin}

// rank orders roles; an unknown role ranks below viewer.
func (r Role) rank() int {
	for i, x := range Roles {
		if r == x {
			return i + 1
		}
	}
	return 0
}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r.rank() > 0 }

// AtLeast reports whether r may do what min may. An unknown r or min is
// never enough (fail closed).
func (r Role) AtLeast(min Role) bool {
	return r.Valid() && min.Valid() && r.rank() >= min.rank()
}
