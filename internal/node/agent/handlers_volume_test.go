package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// fakeVolumes is a runtime that keeps volumes in a map; held ones cannot
// be deleted, as the QEMU runtime's.
type fakeVolumes struct {
	runtime.Runtime
	vols map[string]api.Volume
	err  error
}

func (f *fakeVolumes) ListVolumes(context.Context) ([]api.Volume, error) {
	if f.err != nil {
		return nil, f.err
	}
	var out []api.Volume
	for _, n := range []string{"cache", "pgdata"} {
		if v, ok := f.vols[n]; ok {
			out = append(out, v)
		}
	}
	return out, nil
}

func (f *fakeVolumes) DeleteVolume(_ context.Context, name string) (bool, error) {
	if f.err != nil {
		return false, f.err
	}
	v, ok := f.vols[name]
	if ok && len(v.Holders) > 0 {
		return true, runtime.Errorf(api.ReasonVolumeAttachFailed, "volume", name, "%w: held by instance %s (destroy it first)",
			runtime.ErrVolumeInUse, v.Holders[0])
	}
	delete(f.vols, name)
	return ok, nil
}

func runVolumeTask(h agent.Handler, typ, params string) (agent.Outcome, error) {
	return h.Run(context.Background(), agent.Task{ID: "t1", Type: typ, Params: json.RawMessage(params),
		Progress: func(string, time.Duration, error) {}})
}

// TestVolumeHandlers: volume.list lists through the runtime's volume store
// (behind a Router too); volume.delete is refused with volume_in_use,
// naming the holder, while an instance holds the volume, deletes it
// after, and answers deleted:false for one the node lacks; a name with a
// path trick never reaches the store; a node without microVM volumes
// says volumes_unavailable.
func TestVolumeHandlers(t *testing.T) {
	fv := &fakeVolumes{Runtime: mock.New(mock.Options{}), vols: map[string]api.Volume{
		"pgdata": {Name: "pgdata", Format: "raw", SizeGiB: 10, Holders: []string{"db-1"}},
		"cache":  {Name: "cache", Format: "qcow2", SizeGiB: 1}}}
	routed := runtime.NewRouter(fv, mock.New(mock.Options{}))
	list := agent.VolumeListHandler(func() runtime.Runtime { return routed })
	del := agent.VolumeDeleteHandler(func() runtime.Runtime { return routed })

	out, err := runVolumeTask(list, task.TypeVolumeList, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Output.(task.VolumeListOutput).Volumes; len(got) != 2 || got[1].Name != "pgdata" || got[1].Holders[0] != "db-1" {
		t.Fatalf("list %+v", got)
	}
	_, err = runVolumeTask(del, task.TypeVolumeDelete, `{"name":"pgdata"}`)
	var he *agent.HandlerError
	if !errors.As(err, &he) || he.Code != agent.CodeVolumeInUse || !strings.Contains(he.Message, "held by instance db-1") {
		t.Fatalf("delete while held: %v", err)
	}
	fv.vols["pgdata"] = api.Volume{Name: "pgdata", Format: "raw", SizeGiB: 10} // db-1 destroyed
	if out, err = runVolumeTask(del, task.TypeVolumeDelete, `{"name":"pgdata"}`); err != nil || out.Output != (task.VolumeDeleteOutput{Name: "pgdata", Deleted: true}) {
		t.Fatalf("delete: %+v %v", out, err)
	}
	if out, err = runVolumeTask(del, task.TypeVolumeDelete, `{"name":"pgdata"}`); err != nil || out.Output != (task.VolumeDeleteOutput{Name: "pgdata"}) {
		t.Fatalf("delete again: %+v %v", out, err)
	}
	for _, bad := range []string{`{"name":"../x"}`, `{}`, `{"name":"a/b"}`} {
		if _, err := runVolumeTask(del, task.TypeVolumeDelete, bad); handlerCode(err) != "invalid_params" {
			t.Errorf("%s: %v", bad, err)
		}
	}
	fv.err = fmt.Errorf("volume dir: %w", runtime.ErrNoVolumes)
	if _, err := runVolumeTask(list, task.TypeVolumeList, `{}`); handlerCode(err) != agent.CodeVolumesUnavailable {
		t.Errorf("store without volumes: %v", err)
	}
	fv.err = errors.New("disk on fire")
	if _, err := runVolumeTask(del, task.TypeVolumeDelete, `{"name":"cache"}`); handlerCode(err) != agent.CodeVolumeDeleteFailed {
		t.Errorf("store failure: %v", err)
	}
	for _, rt := range []runtime.Runtime{nil, mock.New(mock.Options{})} {
		h := agent.VolumeListHandler(func() runtime.Runtime { return rt })
		if _, err := runVolumeTask(h, task.TypeVolumeList, `{}`); handlerCode(err) != agent.CodeVolumesUnavailable {
			t.Errorf("runtime %v: %v", rt, err)
		}
	}
}
