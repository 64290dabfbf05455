// Command openapi3gen writes the REST API's OpenAPI 3.1 document from what protoc-gen-openapiv2
// makes of the protos (a Swagger 2.0 document), the protos themselves (a descriptor set from
// `buf build`) and an overlay of what neither can say (statuses, headers, security, webhooks, the
// system endpoints served beside the API).
//
// From the descriptors it derives what the Swagger document loses: which schema is which proto
// message, so that every schema is named after its message; which fields the gateway always sends
// (its marshaler sets EmitDefaultValues: every scalar, enum, list and map field outside a oneof is
// present in an answer, so it is required in every schema an answer reaches); which are
// google.protobuf.Struct (free-form objects) or Duration (a string of seconds); and the enums the
// overlay names that no operation reaches (the ErrorInfo reasons), with their values' comments.
// Operation ids are the RPC's name in lowerCamelCase. The overlay (see the file's own comments) is
// merged last.
//
//	openapi3gen -swagger bin/openapiv2/integrations.swagger.json -descriptors bin/openapiv2/image.binpb \
//	    -overlay proto/integrations/gateway/v1/openapi.yaml -out pkg/gen/openapi/integrations.openapi.yaml
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// service is the one service the REST API serves.
const service = "integrations.gateway.v1.GatewayService"

func main() {
	swaggerPath := flag.String("swagger", "", "protoc-gen-openapiv2's merged document (JSON)")
	descPath := flag.String("descriptors", "", "the protos' descriptor set (buf build -o x.binpb)")
	overlayPath := flag.String("overlay", "", "the overlay (YAML)")
	out := flag.String("out", "", "where to write the OpenAPI 3.1 document (YAML)")
	flag.Parse()
	if err := run(*swaggerPath, *descPath, *overlayPath, *out); err != nil {
		fmt.Fprintln(os.Stderr, "openapi3gen:", err)
		os.Exit(1)
	}
}

func run(swaggerPath, descPath, overlayPath, out string) error {
	if swaggerPath == "" || descPath == "" || overlayPath == "" || out == "" {
		return errors.New("-swagger, -descriptors, -overlay and -out are required")
	}
	files, err := loadDescriptors(descPath)
	if err != nil {
		return err
	}
	doc, err := convert(swaggerPath)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(overlayPath)
	if err != nil {
		return fmt.Errorf("read overlay: %w", err)
	}
	var ov overlay
	if err := yaml.Unmarshal(raw, &ov); err != nil {
		return fmt.Errorf("parse overlay %s: %w", overlayPath, err)
	}
	svc, err := files.FindDescriptorByName(service)
	if err != nil {
		return fmt.Errorf("find %s: %w", service, err)
	}
	if err := build(doc, files, svc.(protoreflect.ServiceDescriptor), &ov); err != nil {
		return err
	}
	text, err := render(doc)
	if err != nil {
		return err
	}
	if err := check(text); err != nil {
		return err
	}
	return os.WriteFile(out, text, 0o644)
}

func loadDescriptors(path string) (*protoregistry.Files, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read descriptors: %w", err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		return nil, fmt.Errorf("decode descriptors %s: %w", path, err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("link descriptors %s: %w", path, err)
	}
	return files, nil
}

// convert is protoc-gen-openapiv2's document in OpenAPI 3 (kin-openapi's openapi2conv), as plain
// JSON values: the rest of the work is renaming and merging, simpler on maps than on types.
func convert(path string) (obj, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read swagger: %w", err)
	}
	var v2 openapi2.T
	if err := json.Unmarshal(raw, &v2); err != nil {
		return nil, fmt.Errorf("parse swagger %s: %w", path, err)
	}
	v3, err := openapi2conv.ToV3(&v2)
	if err != nil {
		return nil, fmt.Errorf("convert to OpenAPI 3: %w", err)
	}
	b, err := json.Marshal(v3)
	if err != nil {
		return nil, fmt.Errorf("marshal OpenAPI 3: %w", err)
	}
	var doc obj
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// overlay is what the protos cannot say. Its OpenAPI parts are OpenAPI 3.1 as written.
type overlay struct {
	Info    obj   `yaml:"info"`
	Servers []any `yaml:"servers"`
	Tags    []any `yaml:"tags"`
	// Security is the document's default requirement.
	Security []any `yaml:"security"`
	// Operations, by operation id: the tag, the statuses, the extra parameters.
	Operations map[string]operation `yaml:"operations"`
	// Components are added to the generated ones; a schema of the same name as a generated one is
	// merged into it (its keys win; required lists are joined).
	Components obj `yaml:"components"`
	// Paths are served beside the API (not by grpc-gateway): added as written.
	Paths    obj `yaml:"paths"`
	Webhooks obj `yaml:"webhooks"`
	// Enums are proto enums, by full name, declared as schemas although no operation's message
	// reaches them (a refusal's ErrorInfo.reason is a string on the wire): each is a string
	// schema named after the enum, its values those sent (not the zero value), its description
	// the enum's comment and each value's.
	Enums []string `yaml:"enums"`
}

type operation struct {
	Tag string `yaml:"tag"`
	// Success are the success statuses with their description and headers (names of
	// components.headers); each answers the RPC's response message.
	Success map[string]success `yaml:"success"`
	// Errors are the error statuses the operation can answer, each a components.responses name.
	Errors []string `yaml:"errors"`
	// Parameters are components.parameters names added to the operation's.
	Parameters []string `yaml:"parameters"`
}

type success struct {
	Description string   `yaml:"description"`
	Headers     []string `yaml:"headers"`
}

// obj is a JSON object.
type obj = map[string]any

// build turns the converted document into ours.
func build(doc obj, files *protoregistry.Files, svc protoreflect.ServiceDescriptor, ov *overlay) error {
	doc["openapi"] = "3.1.0"
	doc["info"] = ov.Info
	doc["servers"] = ov.Servers
	doc["tags"] = ov.Tags
	doc["security"] = ov.Security
	delete(doc, "x-original-swagger-version")

	comps, _ := doc["components"].(obj)
	if comps == nil {
		comps = obj{}
		doc["components"] = comps
	}
	genSchemas, _ := comps["schemas"].(obj)
	if genSchemas == nil {
		genSchemas = obj{}
	}
	delete(comps, "requestBodies")
	n := &namer{gen: genSchemas, out: obj{}, names: map[string]string{}, byName: map[string]string{}, answered: map[string]bool{}}

	paths, _ := doc["paths"].(obj)
	seen := map[string]bool{}
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		item := paths[path].(obj)
		for _, method := range slices.Sorted(maps.Keys(item)) {
			op, ok := item[method].(obj)
			if !ok {
				continue
			}
			if err := n.operation(svc, ov, op, seen); err != nil {
				return fmt.Errorf("%s %s: %w", strings.ToUpper(method), path, err)
			}
		}
	}
	for id := range ov.Operations {
		if !seen[id] {
			return fmt.Errorf("overlay: operation %s is not one of %s's", id, service)
		}
	}
	for name, v := range ov.Paths {
		if _, dup := paths[name]; dup {
			return fmt.Errorf("overlay: path %s is generated already", name)
		}
		paths[name] = v
	}
	// The schemas: those the operations reached, renamed, the enums the overlay names, then the
	// overlay's.
	for _, full := range ov.Enums {
		d, err := files.FindDescriptorByName(protoreflect.FullName(full))
		if err != nil {
			return fmt.Errorf("overlay: enum %s: %w", full, err)
		}
		ed, ok := d.(protoreflect.EnumDescriptor)
		if !ok {
			return fmt.Errorf("overlay: %s is not an enum", full)
		}
		name := string(ed.Name())
		if err := n.claim(name, name, full); err != nil {
			return err
		}
		if _, dup := n.out[name]; dup {
			return fmt.Errorf("overlay: enum %s: an operation reaches it already", full)
		}
		n.out[name] = enumSchema(ed)
	}
	for name, v := range asObj(ov.Components["schemas"]) {
		if cur, ok := n.out[name].(obj); ok {
			mergeSchema(cur, v.(obj))
			continue
		}
		n.out[name] = v
	}
	comps["schemas"] = n.out
	for key, v := range ov.Components {
		if key == "schemas" || strings.HasPrefix(key, "x-") { // x-: the overlay's YAML anchors
			continue
		}
		comps[key] = v
	}
	doc["webhooks"] = ov.Webhooks
	rewriteRefs(doc, n.names)
	return nil
}

// namer names the generated schemas after their proto messages and shapes them.
type namer struct {
	gen    obj               // the converted document's schemas, by protoc-gen-openapiv2's names
	out    obj               // ours, by our names
	names  map[string]string // generated name → ours
	byName map[string]string // our name → the full proto name it stands for
	// answered are our schema names an answer reaches (every field sent is required).
	answered map[string]bool
}

func (n *namer) operation(svc protoreflect.ServiceDescriptor, ov *overlay, op obj, seen map[string]bool) error {
	gid, _ := op["operationId"].(string)
	rpc, ok := strings.CutPrefix(gid, string(svc.Name())+"_")
	if !ok {
		return fmt.Errorf("operation %q is not %s's", gid, svc.Name())
	}
	m := svc.Methods().ByName(protoreflect.Name(rpc))
	if m == nil {
		return fmt.Errorf("no method %s", rpc)
	}
	id := lowerFirst(rpc)
	seen[id] = true
	o, ok := ov.Operations[id]
	if !ok {
		return fmt.Errorf("overlay: operation %s is not described (tag, statuses)", id)
	}
	op["operationId"] = id
	op["tags"] = []any{o.Tag}
	if text, _ := op["summary"].(string); text != "" {
		op["description"] = text
		op["summary"] = summary(text)
	}

	// The answer.
	resps := asObj(op["responses"])
	ok200 := asObj(resps["200"])
	content := asObj(ok200["content"])
	media := asObj(content["application/json"])
	schema := asObj(media["schema"])
	ref, _ := schema["$ref"].(string)
	if ref == "" {
		return errors.New("the 200 answer has no schema")
	}
	if err := n.message(ref, m.Output(), true); err != nil {
		return err
	}
	out := obj{}
	for _, code := range slices.Sorted(maps.Keys(o.Success)) {
		s := o.Success[code]
		r := obj{"description": s.Description, "content": obj{"application/json": obj{"schema": obj{"$ref": ref}}}}
		if len(s.Headers) > 0 {
			h := obj{}
			for _, name := range s.Headers {
				h[name] = obj{"$ref": "#/components/headers/" + name}
			}
			r["headers"] = h
		}
		out[code] = r
	}
	if len(out) == 0 {
		return fmt.Errorf("overlay: operation %s has no success status", id)
	}
	for _, name := range o.Errors {
		code, ok := errorStatus[name]
		if !ok {
			return fmt.Errorf("overlay: operation %s: unknown error response %s", id, name)
		}
		out[code] = obj{"$ref": "#/components/responses/" + name}
	}
	op["responses"] = out

	// The request.
	if body := asObj(op["requestBody"]); body != nil {
		bschema := asObj(asObj(asObj(body["content"])["application/json"])["schema"])
		bref, _ := bschema["$ref"].(string)
		if bref == "" {
			return errors.New("the request body has no schema")
		}
		if err := n.message(bref, m.Input(), false); err != nil {
			return err
		}
		// A body is required only where it must say something: an empty body is an empty
		// request to grpc-gateway.
		body["required"] = len(ov.requiredOf(genName(bref), n.names)) > 0
		delete(body, "x-originalParamName")
	}
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		po := asObj(p)
		if ps := asObj(po["schema"]); ps != nil {
			n.inline(ps, m.Input(), fieldOf(m.Input(), po["name"]))
		}
	}
	for _, name := range o.Parameters {
		params = append(params, obj{"$ref": "#/components/parameters/" + name})
	}
	if len(params) > 0 {
		op["parameters"] = params
	}
	return nil
}

// requiredOf is the overlay's required list for the schema generated as gen.
func (ov *overlay) requiredOf(gen string, names map[string]string) []any {
	s := asObj(asObj(ov.Components["schemas"])[names[gen]])
	r, _ := s["required"].([]any)
	if one, _ := s["oneOf"].([]any); len(one) > 0 {
		r = append(r, one...)
	}
	return r
}

// errorStatus is the HTTP status of each error response the overlay may name.
var errorStatus = map[string]string{
	"BadRequest": "400", "Unauthorized": "401", "Forbidden": "403", "NotFound": "404",
	"MethodNotAllowed": "405", "RequestTimeout": "408", "Conflict": "409", "PayloadTooLarge": "413",
	"TooManyRequests": "429", "Internal": "500", "Unavailable": "503", "GatewayTimeout": "504",
}

// message names the generated schema at ref after md (and every schema it reaches after its
// message or enum), and shapes its properties.
func (n *namer) message(ref string, md protoreflect.MessageDescriptor, answer bool) error {
	gen := genName(ref)
	name := string(md.Name())
	if strings.HasSuffix(gen, "Body") && strings.HasPrefix(gen, service[strings.LastIndex(service, ".")+1:]) {
		// The body of a call with path parameters: the request without them.
		name = strings.TrimSuffix(string(md.Name()), "Request") + "Body"
	}
	if err := n.claim(gen, name, string(md.FullName())); err != nil {
		return err
	}
	if answer {
		if n.answered[name] {
			return nil
		}
		n.answered[name] = true
	} else if _, done := n.out[name]; done {
		return nil
	}
	schema := asObj(n.gen[gen])
	if schema == nil {
		return fmt.Errorf("no schema %s", gen)
	}
	n.out[name] = schema
	props := asObj(schema["properties"])
	var required []any
	for _, key := range slices.Sorted(maps.Keys(props)) {
		fd := md.Fields().ByName(protoreflect.Name(key))
		if fd == nil {
			return fmt.Errorf("%s: property %s is no field of %s (fields must be sent by their proto names)", name, key, md.FullName())
		}
		p := asObj(props[key])
		if answer && fd.ContainingOneof() == nil && !fd.HasPresence() {
			required = append(required, key)
		}
		if err := n.field(p, fd, answer); err != nil {
			return fmt.Errorf("%s.%s: %w", name, key, err)
		}
	}
	if answer && len(required) > 0 {
		schema["required"] = required
	}
	if len(props) == 0 {
		schema["properties"] = obj{}
	}
	return nil
}

// field shapes the schema p of field fd.
func (n *namer) field(p obj, fd protoreflect.FieldDescriptor, answer bool) error {
	target := p
	if fd.IsList() {
		target = asObj(p["items"])
	}
	if ref, _ := target["$ref"].(string); ref != "" {
		switch fd.Kind() {
		case protoreflect.EnumKind:
			return n.enum(ref, fd.Enum())
		case protoreflect.MessageKind, protoreflect.GroupKind:
			delete(target, "type") // protoc-gen-openapiv2 writes `type: object` beside a list's $ref
			return n.message(ref, fd.Message(), answer)
		}
		return fmt.Errorf("a $ref for a %s field", fd.Kind())
	}
	if fd.Kind() == protoreflect.MessageKind {
		wellKnown(target, fd.Message().FullName())
	}
	return nil
}

// inline shapes a query parameter's schema (no $ref there: protoc-gen-openapiv2 inlines enums).
func (n *namer) inline(s obj, _ protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor) {
	if fd != nil && fd.Kind() == protoreflect.MessageKind {
		wellKnown(s, fd.Message().FullName())
	}
}

// wellKnown is the JSON of a well-known type as protojson writes it.
func wellKnown(s obj, name protoreflect.FullName) {
	switch name {
	case "google.protobuf.Struct":
		s["type"] = "object"
		s["additionalProperties"] = true
	case "google.protobuf.Value":
		delete(s, "type")
	case "google.protobuf.Duration":
		s["type"] = "string"
		s["pattern"] = `^-?[0-9]+(\.[0-9]{1,9})?s$`
		if _, ok := s["description"]; !ok {
			s["description"] = `A duration in seconds, with up to nine fractional digits: "1.500s".`
		}
	}
}

func (n *namer) enum(ref string, ed protoreflect.EnumDescriptor) error {
	gen := genName(ref)
	name := string(ed.Name())
	if err := n.claim(gen, name, string(ed.FullName())); err != nil {
		return err
	}
	if s := asObj(n.gen[gen]); s != nil {
		n.out[name] = s
		return nil
	}
	return fmt.Errorf("no schema %s", gen)
}

// enumSchema is the string schema of an enum the overlay names: its values but the zero one
// (never sent), and a description of the enum's comment followed by a line per value with its
// comment, as protoc-gen-openapiv2 describes the enums it reaches.
func enumSchema(ed protoreflect.EnumDescriptor) obj {
	locs := ed.ParentFile().SourceLocations()
	var values []any
	var lines []string
	for i := range ed.Values().Len() {
		v := ed.Values().Get(i)
		if v.Number() == 0 {
			continue
		}
		values = append(values, string(v.Name()))
		lines = append(lines, fmt.Sprintf("- %s — %s", v.Name(), strings.Join(strings.Fields(locs.ByDescriptor(v).LeadingComments), " ")))
	}
	desc := strings.TrimSpace(trimComment(locs.ByDescriptor(ed).LeadingComments))
	return obj{"type": "string", "enum": values, "description": desc + "\n\n" + strings.Join(lines, "\n")}
}

// trimComment is a proto comment's text without the space each line starts with.
func trimComment(c string) string {
	lines := strings.Split(c, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, " ")
	}
	return strings.Join(lines, "\n")
}

// claim records that the generated schema gen is ours as name, standing for full.
func (n *namer) claim(gen, name, full string) error {
	if prev, ok := n.byName[name]; ok && prev != full {
		return fmt.Errorf("schema name %s stands for both %s and %s", name, prev, full)
	}
	if prev, ok := n.names[gen]; ok && prev != name {
		return fmt.Errorf("schema %s named both %s and %s", gen, prev, name)
	}
	n.byName[name] = full
	n.names[gen] = name
	return nil
}

// fieldOf is md's field a query parameter names ("a.b" for a nested one), or nil.
func fieldOf(md protoreflect.MessageDescriptor, name any) protoreflect.FieldDescriptor {
	s, _ := name.(string)
	parts := strings.Split(s, ".")
	var fd protoreflect.FieldDescriptor
	for i, part := range parts {
		fd = md.Fields().ByName(protoreflect.Name(part))
		if fd == nil {
			return nil
		}
		if i < len(parts)-1 {
			if fd.Message() == nil {
				return nil
			}
			md = fd.Message()
		}
	}
	return fd
}

// mergeSchema merges the overlay's keys into a generated schema: required lists are joined,
// properties merged one by one, anything else replaced.
func mergeSchema(dst, src obj) {
	for k, v := range src {
		switch k {
		case "required":
			have, _ := dst["required"].([]any)
			for _, r := range v.([]any) {
				if !slices.Contains(have, r) {
					have = append(have, r)
				}
			}
			dst["required"] = have
		case "properties":
			props := asObj(dst["properties"])
			for pk, pv := range asObj(v) {
				if cur := asObj(props[pk]); cur != nil {
					maps.Copy(cur, asObj(pv))
				} else {
					props[pk] = pv
				}
			}
		default:
			dst[k] = v
		}
	}
}

// rewriteRefs points every $ref to a generated schema at our name for it.
func rewriteRefs(v any, names map[string]string) {
	switch v := v.(type) {
	case obj:
		if ref, ok := v["$ref"].(string); ok {
			if name, ok := names[genName(ref)]; ok && strings.HasPrefix(ref, "#/components/schemas/") {
				v["$ref"] = "#/components/schemas/" + name
			}
		}
		for _, x := range v {
			rewriteRefs(x, names)
		}
	case []any:
		for _, x := range v {
			rewriteRefs(x, names)
		}
	}
}

func genName(ref string) string { return ref[strings.LastIndex(ref, "/")+1:] }

func asObj(v any) obj {
	o, _ := v.(obj)
	return o
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// summary is the first sentence of an RPC's comment, on one line.
func summary(text string) string {
	text = strings.Join(strings.Fields(text), " ")
	if i := strings.Index(text, ". "); i >= 0 {
		return text[:i+1]
	}
	return text
}

// topOrder is the order of the document's top-level keys; everything below is sorted.
var topOrder = []string{"openapi", "info", "servers", "security", "tags", "paths", "webhooks", "components"}

// render writes doc as YAML: the top level in the usual order, maps below sorted by key.
func render(doc obj) ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range topOrder {
		v, ok := doc[k]
		if !ok {
			continue
		}
		var val yaml.Node
		if err := val.Encode(v); err != nil {
			return nil, fmt.Errorf("encode %s: %w", k, err)
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &val)
	}
	for _, k := range slices.Sorted(maps.Keys(doc)) {
		if !slices.Contains(topOrder, k) {
			return nil, fmt.Errorf("unexpected top-level key %s", k)
		}
	}
	var buf bytes.Buffer
	buf.WriteString("# Code generated by tools/openapi3gen from proto/ and proto/integrations/gateway/v1/openapi.yaml. DO NOT EDIT.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// check loads the document as a client would and validates it as OpenAPI 3.1.
func check(text []byte) error {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(text)
	if err != nil {
		return fmt.Errorf("load the written document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return fmt.Errorf("the written document is not valid OpenAPI: %w", err)
	}
	return nil
}
