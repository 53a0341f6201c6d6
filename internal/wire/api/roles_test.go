package api

import "testing"

func TestRoleAtLeast(t *testing.T) {
	tests := []struct {
		r, min Role
		want   bool
	}{
		{RoleViewer, RoleViewer, true},
		{RoleViewer, RoleOperator, false},
		{RoleViewer, RoleAdmin, false},
		{RoleOperator, RoleViewer, true},
		{RoleOperator, RoleOperator, true},
		{RoleOperator, RoleAdmin, false},
		{RoleAdmin, RoleViewer, true},
		{RoleAdmin, RoleOperator, true},
		{RoleAdmin, RoleAdmin, true},
		{"root", RoleViewer, false},     // unknown role: nothing
		{"", RoleViewer, false},         // no role: nothing
		{RoleAdmin, "", false},          // a route without a role admits no one
		{RoleAdmin, "superuser", false}, // nor one with an unknown role
	}
	for _, tt := range tests {
		if got := tt.r.AtLeast(tt.min); got != tt.want {
			t.Errorf("%q.AtLeast(%q) = %v, want %v", tt.r, tt.min, got, tt.want)
		}
	}
	for _, r := range Roles {
		if !r.Valid() {
			t.Errorf("%q not valid", r)
		}
	}
	if Role("Admin").Valid() {
		t.Error("roles are case-sensitive")
	}
}
