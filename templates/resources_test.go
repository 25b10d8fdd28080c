package templates

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMergeResourcesPrecedence(t *testing.T) {
	tp := &Template{Name: "t", Resources: Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		flags   Resources
		want    Resources
		wantErr string
	}{
		{name: "template default", want: Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}},
		{name: "env over template",
			env:  map[string]string{"BOX_CPU": "4", "BOX_MEMORY": "8GiB", "BOX_DISK": "40GB"},
			want: Resources{CPU: "4", Memory: "8GiB", Disk: "40GB"}},
		{name: "flags over template",
			flags: Resources{CPU: "6", Memory: "512MiB", Disk: "10GiB"},
			want:  Resources{CPU: "6", Memory: "512MiB", Disk: "10GiB"}},
		{name: "flags over env",
			env:   map[string]string{"BOX_CPU": "4", "BOX_MEMORY": "8GiB", "BOX_DISK": "40GB"},
			flags: Resources{CPU: "8", Memory: "16GiB", Disk: "80GiB"},
			want:  Resources{CPU: "8", Memory: "16GiB", Disk: "80GiB"}},
		{name: "each field on its own",
			env:   map[string]string{"BOX_MEMORY": "8GiB"},
			flags: Resources{Disk: "30GiB"},
			want:  Resources{CPU: "2", Memory: "8GiB", Disk: "30GiB"}},
		{name: "empty env and flags keep the default",
			env:  map[string]string{"BOX_CPU": "", "BOX_MEMORY": "  "},
			want: Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}},
		{name: "env whitespace trimmed",
			env:  map[string]string{"BOX_CPU": " 3\n"},
			want: Resources{CPU: "3", Memory: "4GiB", Disk: "20GiB"}},
		{name: "bad env named",
			env:     map[string]string{"BOX_MEMORY": "8G"},
			wantErr: `BOX_MEMORY: memory: size "8G"`},
		{name: "bad flag named",
			flags:   Resources{CPU: "0"},
			wantErr: `--cpu: cpu "0"`},
		{name: "a bad flag is not rescued by a good env",
			env:     map[string]string{"BOX_DISK": "40GiB"},
			flags:   Resources{Disk: "20"},
			wantErr: `--disk: disk: size "20"`},
		{name: "a good flag hides a bad env",
			env:   map[string]string{"BOX_DISK": "lots"},
			flags: Resources{Disk: "40GiB"},
			want:  Resources{CPU: "2", Memory: "4GiB", Disk: "40GiB"}},
		{name: "too small named",
			env:     map[string]string{"BOX_MEMORY": "64MiB"},
			wantErr: "BOX_MEMORY: memory \"64MiB\" is below the 128MiB",
		},
		{name: "none in the environment leaves the limit unset",
			env:  map[string]string{"BOX_MEMORY": " none\n"},
			want: Resources{CPU: "2", Memory: "", Disk: "20GiB"}},
		{name: "a flag beats none in the environment",
			env:   map[string]string{"BOX_MEMORY": "none"},
			flags: Resources{Memory: "1GiB"},
			want:  Resources{CPU: "2", Memory: "1GiB", Disk: "20GiB"}},
		{name: "none as a flag beats the environment",
			env:   map[string]string{"BOX_MEMORY": "1GiB", "BOX_CPU": "lots"},
			flags: Resources{Memory: "none", CPU: "none", Disk: "none"},
			want:  Resources{}},
		{name: "none does not hide a bad value elsewhere",
			env:     map[string]string{"BOX_CPU": "none", "BOX_DISK": "big"},
			wantErr: `BOX_DISK: disk: size "big"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MergeResources(tp, func(k string) string { return tc.env[k] }, tc.flags)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestMergeResourcesBadTemplateDefault(t *testing.T) {
	tp := &Template{Name: "t", Resources: Resources{CPU: "2", Memory: "4", Disk: "20GiB"}}
	_, err := MergeResources(tp, nil, Resources{})
	require.ErrorContains(t, err, `template "t": memory: size "4"`)

	_, err = MergeResources(nil, nil, Resources{})
	require.Error(t, err)
}

func TestNoLimitIsNotATemplateValue(t *testing.T) {
	tp := &Template{Name: "t", Resources: Resources{CPU: "2", Memory: NoLimit, Disk: "20GiB"}}
	_, err := MergeResources(tp, nil, Resources{})
	require.ErrorContains(t, err, `template "t": memory: size "none"`)
}

func TestResourcesString(t *testing.T) {
	require.Equal(t, "2 CPU, 4GiB memory, 20GiB disk", Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}.String())
	require.Equal(t, "unlimited CPU, 4GiB memory, unlimited disk", Resources{Memory: "4GiB"}.String())
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"4GiB", 4 << 30, true},
		{"512MiB", 512 << 20, true},
		{"20GB", 20e9, true},
		{"1TiB", 1 << 40, true},
		{"100kB", 100e3, true},
		{"4", 0, false},
		{"4G", 0, false},
		{"4 GiB", 0, false},
		{"0GiB", 0, false},
		{"04GiB", 0, false},
		{"-4GiB", 0, false},
		{"1.5GiB", 0, false},
		{"", 0, false},
		{"20000000TiB", 0, false},
	} {
		got, err := ParseSize(tc.in)
		if !tc.ok {
			require.Error(t, err, "ParseSize(%q)", tc.in)
			continue
		}
		require.NoError(t, err, "ParseSize(%q)", tc.in)
		require.Equal(t, tc.want, got, "ParseSize(%q)", tc.in)
	}
}

func TestParseCPU(t *testing.T) {
	for in, want := range map[string]int{"1": 1, "16": 16} {
		got, err := ParseCPU(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "0", "-2", "+2", "02", "1.5", "0-3", "two"} {
		_, err := ParseCPU(in)
		require.Error(t, err, "ParseCPU(%q)", in)
	}
}

func TestProcessesAndAllowance(t *testing.T) {
	tp := &Template{Name: "t", Resources: Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB", Processes: "2048", CPUAllowance: "50%"}}
	got, err := MergeResources(tp, nil, Resources{})
	require.NoError(t, err)
	require.Equal(t, tp.Resources, got, "the template's defaults")
	got, err = MergeResources(tp, func(k string) string {
		return map[string]string{"BOX_PROCESSES": "512", "BOX_CPU_ALLOWANCE": "25ms/100ms"}[k]
	}, Resources{})
	require.NoError(t, err)
	require.Equal(t, "512", got.Processes)
	require.Equal(t, "25ms/100ms", got.CPUAllowance)
	got, err = MergeResources(tp, func(k string) string { return map[string]string{"BOX_PROCESSES": "none"}[k] }, Resources{})
	require.NoError(t, err)
	require.Empty(t, got.Processes, "none leaves it unset")
	got, err = MergeResources(&Template{Name: "t", Resources: Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}}, nil, Resources{})
	require.NoError(t, err)
	require.Empty(t, got.Processes+got.CPUAllowance, "a template may leave them out")
	require.Equal(t, "2 CPU, 4GiB memory, 20GiB disk, 2048 processes, CPU allowance 50%", tp.Resources.String())

	for _, bad := range []struct{ processes, allowance, want string }{
		{"lots", "", `processes "lots": want a whole number`},
		{"10", "", `processes "10" is below the 64`},
		{"0100", "", "want a whole number"},
		{"", "150%", "a share is at most 100%"},
		{"", "0%", "want a share like 50%"},
		{"", "50ms/5ms", "the period must be 10ms to 1000ms"},
		{"", "half", "want a share like 50%"},
		{"", "2", "want a share like 50%"},
	} {
		r := tp.Resources
		r.Processes, r.CPUAllowance = bad.processes, bad.allowance
		require.ErrorContains(t, r.Validate(), bad.want, "%+v", bad)
	}
	for _, name := range []string{"blank", "claude", "codex", "grok"} {
		bt, err := Get(name)
		require.NoError(t, err)
		require.NotEmpty(t, bt.Resources.Processes, "%s carries a process limit", name)
		require.NotEmpty(t, bt.Resources.CPUAllowance, "%s carries a CPU allowance", name)
	}
}
