package instances

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxReplicas bounds one group.
const maxReplicas = 1000

// Scale is POST /api/v1/instance-groups/{group}/scale: it makes Replicas
// instances of a group wanted: it creates <group>-<n> (lowest free n) from
// the template, or marks the highest-numbered live members deleted. Scaling
// up is planned in full before anything is created, so a group that does not
// fit creates nothing.
func (s *Room) Scale(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	group := r.PathValue("group")
	var req api.ScaleRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	var fields []api.FieldError
	if !groupNameRE.MatchString(group) {
		fields = append(fields, api.FieldError{Field: "group", Message: "must match " + groupNameRE.String()})
	}
	if req.Replicas < 0 || req.Replicas > maxReplicas {
		fields = append(fields, api.FieldError{Field: "replicas", Message: fmt.Sprintf("must be 0..%d", maxReplicas)})
	}
	if req.Template != nil {
		for _, fe := range validateCreate(*req.Template, false) {
			fe.Field = "template." + fe.Field
			fields = append(fields, fe)
		}
	}
	lf := &fieldErrs{}
	validateLabels(lf, "host_labels", req.HostLabels)
	if fields = append(fields, lf.list...); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}

	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	members, err := s.store.ListInstances(ctx, store.InstanceFilter{Group: group})
	if err != nil {
		return err
	}
	var live []store.Instance
	for _, in := range members {
		if in.DesiredState != api.DesiredDeleted {
			live = append(live, in)
		}
	}
	resp := api.ScaleResponse{Group: group, Replicas: req.Replicas}
	switch {
	case len(live) > req.Replicas:
		// Highest number first; members without a number go last.
		sort.SliceStable(live, func(i, j int) bool {
			ni, nj := instanceSuffix(group, live[i].Name), instanceSuffix(group, live[j].Name)
			if ni != nj {
				return ni > nj
			}
			return live[i].Name > live[j].Name
		})
		for _, in := range live[:len(live)-req.Replicas] {
			if _, err := s.markDeleted(ctx, in.ID); err != nil {
				return err
			}
			resp.Deleted = append(resp.Deleted, in.ID)
		}
	case len(live) < req.Replicas:
		tmpl, err := groupTemplate(group, req, members, live)
		if err != nil {
			return err
		}
		f, err := s.loadFleet(ctx)
		if err != nil {
			return err
		}
		reqs := make([]api.CreateInstanceRequest, 0, req.Replicas-len(live))
		plan := f.clone()
		for n := 1; len(reqs) < req.Replicas-len(live); n++ {
			one := tmpl
			one.Name = fmt.Sprintf("%s-%d", group, n)
			if plan.names[one.Name] {
				continue
			}
			hostID, err := s.pickHost(ctx, plan, one)
			if err != nil {
				return err
			}
			plan.add(hostID, one.Name, api.DesiredRunning, one.Spec)
			reqs = append(reqs, one)
		}
		for _, one := range reqs {
			in, err := s.createPlaced(ctx, f, one)
			if err != nil {
				return partialScale(resp, err)
			}
			resp.Created = append(resp.Created, instanceView(in))
		}
	}
	s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "instance_group.scale", Target: group, Result: "ok",
		CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("replicas=%d created=%d deleted=%d", req.Replicas, len(resp.Created), len(resp.Deleted))})
	httpapi.WriteJSON(w, http.StatusOK, resp)
	return nil
}

// groupTemplate is what new members are made from: the request's template,
// else the lowest-numbered member (live ones first).
func groupTemplate(group string, req api.ScaleRequest, members, live []store.Instance) (api.CreateInstanceRequest, error) {
	var tmpl api.CreateInstanceRequest
	switch {
	case req.Template != nil:
		tmpl = *req.Template
	default:
		from := live
		if len(from) == 0 {
			from = members
		}
		if len(from) == 0 {
			return tmpl, httpapi.Invalid([]api.FieldError{{Field: "template",
				Message: fmt.Sprintf("group %q has no instance to copy: a template is required", group)}})
		}
		src := from[0]
		for _, in := range from[1:] {
			if n := instanceSuffix(group, in.Name); n >= 0 && (instanceSuffix(group, src.Name) < 0 || n < instanceSuffix(group, src.Name)) {
				src = in
			}
		}
		tmpl.Labels = src.Labels
		if err := json.Unmarshal(src.Spec, &tmpl.Spec); err != nil {
			return tmpl, fmt.Errorf("instance %s: decode spec: %w", src.ID, err)
		}
	}
	tmpl.Group = group
	if len(req.HostLabels) > 0 {
		tmpl.HostLabels = req.HostLabels
	}
	return tmpl, nil
}

// partialScale reports a scale-up that another replica's placement cut
// short after some members were created.
func partialScale(resp api.ScaleResponse, err error) error {
	var he *httpapi.Error
	if len(resp.Created) == 0 || !errors.As(err, &he) {
		return err
	}
	names := make([]string, 0, len(resp.Created))
	for _, in := range resp.Created {
		names = append(names, in.Name)
	}
	return &httpapi.Error{Status: he.Status, RetryAfter: he.RetryAfter, CodedError: api.CodedError{Code: he.Code,
		Message: fmt.Sprintf("created %s, then: %s", strings.Join(names, ", "), he.Message)}}
}
