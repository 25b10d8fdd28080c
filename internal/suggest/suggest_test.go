package suggest

import "testing"

func TestDidYouMean(t *testing.T) {
	names := []string{"world", "version", "run", "list", "snapshot", "setup-host"}
	for _, tc := range []struct{ typo, want string }{
		{"wrold", ` (did you mean "world"?)`},
		{"verison", ` (did you mean "version"?)`},
		{"snap", ` (did you mean "snapshot"?)`},
		{"setup", ` (did you mean "setup-host"?)`},
		{"zzzzzzzz", ""},
		{"", ""},
	} {
		if got := DidYouMean(tc.typo, names); got != tc.want {
			t.Errorf("DidYouMean(%q) = %q, want %q", tc.typo, got, tc.want)
		}
	}
	if d := Distance("kitten", "sitting"); d != 3 {
		t.Errorf("Distance(kitten, sitting) = %d, want 3", d)
	}
}
